"""The backbone: layers, the scanned Transformer, and its validated config."""
