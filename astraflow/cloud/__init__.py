"""Launching a flow on the cloud: plans, prices, SkyPilot jobs, Modal apps, launch records."""
