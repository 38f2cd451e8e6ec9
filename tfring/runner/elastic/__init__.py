"""Elastic training's launcher side: :mod:`~tfring.runner.elastic.driver`
runs the workers a discovery script allows and publishes each round's
membership (what it shares with the workers is
:mod:`tfring._store.elastic_protocol`; see docs/elastic.md)."""
