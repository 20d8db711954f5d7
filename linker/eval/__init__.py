"""Evaluation: Medical Crossing filters, Acc@k metrics, reports (the labelled datasets: `linker.datasets`)."""
