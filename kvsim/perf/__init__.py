"""What a step costs and what fits: KV-cache sizing per GPU and the roofline step-time model."""
