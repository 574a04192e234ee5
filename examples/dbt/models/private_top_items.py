from frontends.dbt_model import private_top_k_model


def model(dbt, session):
    """The 10 most voted items of item_votes under (1, 1e-6)-DP, charged to the principal of
    this model's config (dbt_project.yml) once per run date."""
    dbt.config(materialized="table")
    return private_top_k_model(
        dbt,
        session,
        dbt.ref("item_votes"),  # dbt builds it first; its table is read
        k=10,
        epsilon=1.0,
        delta=1e-6,
        id="item",
        score="votes",
        ledger=dbt.config.get("topk_ledger"),
        principal=dbt.config.get("topk_principal"),
        run_date=dbt.config.get("topk_run_date"),
    )
