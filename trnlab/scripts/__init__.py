"""Scripts that ``trnlab.launch`` runs under torchrun (one process per rank)."""
