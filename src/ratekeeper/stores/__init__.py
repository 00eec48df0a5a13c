"""Stores execute plans. Each is small; capabilities are separate protocols (see ``base``)."""
