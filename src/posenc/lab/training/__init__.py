"""The lab's second stage: tokens and training. Corpora and batches, the distributed state,
weights-only checkpoints, and the training loop with exact resume."""
