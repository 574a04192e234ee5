from adapters.memory import ArraySource
from topk_middleware import private_top_k


def test_clear_winner_is_found() -> None:
    scores = [0.0] * 1000
    scores[417] = 10_000.0
    result = private_top_k(ArraySource(scores), k=1, epsilon=1.0, seed=3)
    assert result.items == [417]
    assert result.accesses.total < 1000
