"""Evaluation of trained models, the run report and run comparison."""
