"""Published measurements the GPU model answers to: the anchors table and each row's prediction."""
