"""New job: pick an operation this user may start, fill in its input and options,
enqueue it through ``durable.jobs``.

The engine judges the input (``InputRejected`` lands beside the field it names);
an operation's unique key may answer with the unfinished job it already has.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from durable import jobs as engine
from durable.errors import DurableError, InputRejected, UnknownOperation

from . import audit
from .access import can_add, refuse, staff_required
from .forms import OptionsForm, attach_job_refusal, input_form, job_input
from .operation_picker import choose_operation


@staff_required
def new_job(request: HttpRequest) -> HttpResponse:
    """Only the operations this user may start are listed, and only they are accepted."""
    if not can_add(request.user):
        return refuse(request, "no-permission:add", "You may not start jobs.")
    chosen = choose_operation(request, "new", "problems/new_job.html")
    if isinstance(chosen, HttpResponse):
        return chosen
    name, operation, context = chosen.name, chosen.operation, chosen.context
    bound = request.method == "POST"
    form = input_form(operation, request.POST if bound else None)
    options = OptionsForm(request.POST if bound else None, prefix="job")
    if bound and form.is_valid() and options.is_valid():
        try:
            job = engine.enqueue(
                name,
                job_input(form),
                owner=audit.actor(request),
                priority=options.cleaned_data.get("priority"),
                on_restart=options.cleaned_data.get("on_restart") or None,
            )
        except InputRejected as error:
            attach_job_refusal(error, form, options)
        except (UnknownOperation, DurableError) as error:
            form.add_error(None, str(error))
        else:
            if not getattr(job, "created", True):  # set by enqueue(), not a column
                # The operation's unique key (one restore per database, one move per
                # pair of storages…) returned the unfinished job: nothing was started.
                messages.info(
                    request,
                    f"Job {job.pk} ({job.operation}) is already doing this ({job.state}); "
                    "nothing new was started.",
                )
                return redirect("problems:job", job.pk)
            audit.record_action(
                request,
                audit.CREATED_EVENT,
                detail=f"{audit.actor(request)} started job {job.pk} ({name})",
                done=True,
                job_ids=[job.pk],
                titles=[name],
                job_id=job.pk,
                operation=name,
            )
            messages.success(request, f"Job {job.pk} ({name}) is queued.")
            return redirect("problems:job", job.pk)
    context.update(operation=operation, form=form, options=options)
    return render(request, "problems/new_job.html", context)
