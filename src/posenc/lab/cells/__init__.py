"""The lab's first stage: what a cell *is*. Configuration dataclasses and named presets, the one
label parser and a label's options, the CLI's flag table, a cell resolved once, and the
identities that key its checkpoints and rows."""
