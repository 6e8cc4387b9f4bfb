"""Azure Functions entry point (Python v2 programming model): the reaper every 5 minutes.

Shipped at the root of the Azure function package (infra/clouds/azure/package.py); the
Functions host imports it and finds the timer function through the decorators. The run is
the same as on the other clouds: azure_handler (entry.py, shipped beside this file as
handler.py) reads the App settings (GPUFLEET_STACK, GPUFLEET_AZURE_SUBSCRIPTION_ID, ...;
see gpufleet_reaper/azure.py) and raises after logging when a stop or a metrics read
failed, so the invocation shows as failed in the host's logs and metrics.
"""

import azure.functions as func
from handler import azure_handler

SCHEDULE = "0 */5 * * * *"  # NCRONTAB with seconds: at second 0 of every fifth minute

app = func.FunctionApp()


@app.timer_trigger(schedule=SCHEDULE, arg_name="timer", run_on_startup=False, use_monitor=True)
def gpufleet_reaper(timer: func.TimerRequest) -> None:
    azure_handler(timer, None)
