"""Speculative decoding: a proposer guesses the next tokens of a reply, one forward checks
them all, and the reply keeps the ones the model agrees with (see docs/ARCHITECTURE.md,
"Speculative decoding"). The method names are engine.sampling_params'."""
