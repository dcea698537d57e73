"""Runnable examples (README "faust apps"); each is run by a test."""
