"""A throwaway fifth cloud, as its author writes it: copied by tests/infra/test_new_cloud.py
into a temporary folder that is put on infra.clouds' path (with its catalog.toml), where
every part of the program finds it by its folder alone."""
