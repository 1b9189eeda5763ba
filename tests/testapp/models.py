from django.db import models


class SideEffect(models.Model):
    """One row per executed unit of ``test.rows``; duplicates would show as extra rows."""

    job_id = models.BigIntegerField()
    key = models.CharField(max_length=255)
    worker = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.job_id} {self.key}"
