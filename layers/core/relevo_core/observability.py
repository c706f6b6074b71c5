"""One logger, tracer and metrics set for every function (Powertools)."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger()
tracer = Tracer()
metrics = Metrics()
