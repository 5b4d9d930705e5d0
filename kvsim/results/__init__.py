"""What a run produced: streamed metrics, the results folder, the HTML report and terminal tables."""
