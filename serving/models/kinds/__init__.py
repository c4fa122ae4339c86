"""The kinds of served model: towers, CLIP encoders, the captioner, search and recommend."""
