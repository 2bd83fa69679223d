"""Building blocks of the decoder: linear, norm, rotary, attention, MLP, LM head."""
