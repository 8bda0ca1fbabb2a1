"""Why an evaluator found no cards."""


class NoFit(Exception):
    """No cards on this node satisfy the request right now; the message names the shortfall."""
