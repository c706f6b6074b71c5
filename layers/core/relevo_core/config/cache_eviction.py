"""Where a project's caches are: CacheEvictionFunction's environment, and the cache routes'."""

# Annotations are evaluated as written (no `from __future__ import annotations`), as in sweeper.py.

from functools import lru_cache

from pydantic import Field, field_validator

from relevo_core.config import TableSettings


class CacheBucketSettings(TableSettings):
    artifact_bucket: str = Field(alias="ARTIFACT_BUCKET")


class CacheEvictionSettings(CacheBucketSettings):
    # The stack's region affinities: the hourly run checks every project's caches in each.
    regions: tuple[str, ...] = Field(alias="REGION_AFFINITIES", min_length=1)

    @field_validator("regions", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(region.strip() for region in value.split(",") if region.strip())
        return value


@lru_cache(maxsize=1)
def cache_eviction_settings() -> CacheEvictionSettings:
    return CacheEvictionSettings.from_environ()


@lru_cache(maxsize=1)
def cache_bucket_settings() -> CacheBucketSettings:
    return CacheBucketSettings.from_environ()
