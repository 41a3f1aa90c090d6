"""span — Locate and Label (Shen et al., ACL 2021): seed spans → filter + boundary regressor →
classifier on the adjusted spans → Soft-NMS. Flat and nested entities."""
