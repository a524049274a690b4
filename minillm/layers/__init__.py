"""Layers: pure functions (what the notebooks show and the exercises ask for) plus thin nn.Modules."""
