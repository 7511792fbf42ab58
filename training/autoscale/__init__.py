"""`--auto_scale`: the searches (search) over training trials (trials), by throughput or by time to a score (to_score)."""
