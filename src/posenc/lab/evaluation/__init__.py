"""The lab's third stage: measuring a trained model. Bits per byte at every length and RoPE
rescaling, the synthetic tasks and the passkey prompt, and the attention probe."""
