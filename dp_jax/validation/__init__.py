"""Validation of the cost model: predictions against published GPU measurements, against runs
here (the local measurement shared by the validate app and the main job), error summaries."""
