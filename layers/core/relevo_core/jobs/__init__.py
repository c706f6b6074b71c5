"""What an operator does with a job once it exists: view, list, logs, artifacts, metrics, cancel,
approve, resolve a stage for review, and reorder the queue."""
