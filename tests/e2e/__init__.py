"""End-to-end tests of the distributed run: real Daphne, Celery, Redis, PostgreSQL and agents on loopback."""
