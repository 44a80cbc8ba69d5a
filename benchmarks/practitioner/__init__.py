"""The practitioner zoo: victims trained the ordinary way (plain PyTorch loops), their diagnostics and their audits."""
