"""Launching a flow on the cloud, one module per concern, dependencies one way:

    jobs         the plan's data (SkyJob, ModalCall, Launched), secrets, job names
    skypilot     task files (a checkout's sky/, or package data), sky.Task, job queue
    modal_calls  the deployed Modal app (apps/rollout.py), its lookup, call cancels
    prices       hourly estimates of SkyPilot jobs from the price catalog
    plan         plan(flow) -> LaunchPlan: pure and offline, describe() with prices
    records      what each launch started (in the store), and stop()
    launch       launch(plan): validate everything, publish the flow, start the jobs
"""
