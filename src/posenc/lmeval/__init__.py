"""posenc inside lm-evaluation-harness: posenc's offline tasks as an lm-eval task folder
(:mod:`.taskdir`)."""
