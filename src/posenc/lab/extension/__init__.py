"""``posenc lab extend``: a trained cell extended to longer contexts by fine-tuning, each
method's curve of steps against the reference trained at the target length."""
