{{ config(materialized="table") }}
-- one row per item: its number of distinct voters (each client adds at most 1 to a count)
select
    'item_' || lpad(cast(i as varchar), 5, '0') as item,
    cast(floor(100000 / (1 + ((i * 7919) % 20000))) as bigint) as votes
from range(20000) as t(i)
