"""Residual designs: pure update rules over the state carried through the layer scan."""
