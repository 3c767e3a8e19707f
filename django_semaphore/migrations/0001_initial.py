from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Semaphore",
            fields=[
                (
                    "name",
                    models.CharField(max_length=200, primary_key=True, serialize=False, verbose_name="name"),
                ),
            ],
            options={
                "verbose_name": "semaphore",
                "verbose_name_plural": "semaphores",
                "managed": False,
            },
        ),
    ]
