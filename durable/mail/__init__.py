"""Notification mail: recipients, one delivery record per (event, recipient), at-least-once."""
