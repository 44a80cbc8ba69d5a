"""The audit: a user's own model, weights and images in; a verdict (leaks / no evidence / inconclusive) out."""

from exhume.audit.config import AuditConfig
from exhume.audit.facade import AuditResult, audit
from exhume.audit.loading import load_images, load_model_class, load_weights
from exhume.victim.wrap import Audited

__all__ = ["AuditConfig", "AuditResult", "Audited", "audit", "load_images", "load_model_class", "load_weights"]
