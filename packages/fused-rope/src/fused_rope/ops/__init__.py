"""Launchers, custom operators, autograd Functions and the functional API."""
