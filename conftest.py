# The shared test kit's plugin: markers, exact skip reasons, seeding, the run's summary.
pytest_plugins = ("tritonformer_testkit.plugin",)
