"""One logger, tracer and metrics set for every function (Powertools)."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger()
# Relevo's functions call AWS through botocore only: patch that, not the X-Ray SDK's default list
# (which imports requests, httplib and others just to patch them, at every cold start).
tracer = Tracer(patch_modules=("botocore",))
metrics = Metrics()
