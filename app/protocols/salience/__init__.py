"""Salience: token sessions (sans-IO core)."""
