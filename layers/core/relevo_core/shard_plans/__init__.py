"""A sharded stage's test plan (docs/test-results.md, "The plan" and "The split"): its listing
read (listing), split across the shards by measured time (split), checked against what each shard
ran (check). Pure: no AWS, no clock; the claim route and the agent call them."""
