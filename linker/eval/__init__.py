"""Evaluation: datasets, Medical Crossing filters, Acc@k metrics, reports."""
