"""Elastic training's launcher side: :mod:`~tfring.runner.elastic.driver`
runs the workers a discovery script allows and publishes each round's
membership; :mod:`~tfring.runner.elastic.protocol` is what it shares with
the workers (see docs/elastic.md)."""
