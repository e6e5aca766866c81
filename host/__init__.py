"""The host side: drive a decode engine (golden model, simulated hardware or board) with tokens."""
