# syntax=docker/dockerfile:1
# An image for your own handler: the Modelplex replica runtime plus your code in /app
# (on PYTHONPATH), so `handler: "recs.models:Recommender"` imports /app/recs/models.py.
#   docker build -f examples/operator/handler-image.Dockerfile -t registry.example.com/recs:1.4 path/to/your/code
FROM modelplex/replica:0.1.0
COPY --chown=10001:10001 recs/ /app/recs/
