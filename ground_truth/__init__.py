"""Ground truth: labeling tasks and queues, the annotators' web app, agreement and review, dataset
releases. Plain Python without Dagster; the assets are in assets/ground_truth.py."""
