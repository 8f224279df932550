"""Simulation engines (pure functions, tested headless) and their thin ipywidgets views."""
