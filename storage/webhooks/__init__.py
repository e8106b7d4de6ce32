"""Webhooks: endpoints tenants register, the event outbox, deliveries and their attempts (docs/webhooks.md)."""
