"""The speed layer: approximate CTR views of the last minutes, fresh within seconds."""
