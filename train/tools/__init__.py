"""Looking into a trained run: loading it (trained), recording attention, drawing figures
and the attention explorer page."""
