"""The shared trainer behind `train-policy`, `train-rm` and `sft`: the options every trainer
shares (fields), samples from the records (samples), the model loaded or borrowed from the
engine (model), the update loop (trainer) with its losses, verdict objectives and resumable
state."""
