SMALL = ["--max-reasoning-tokens", "64", "--max-answer-tokens", "32"]
"""Reduced runs check the bench's bookkeeping, not the model: small budgets (references get 4x)."""
