"""MobileViT-small from transformers (random init, 2 images of 224x224): its activations decay
into subnormal numbers."""
import torch
from transformers import MobileViTConfig, MobileViTForImageClassification

torch.manual_seed(0)
model = MobileViTForImageClassification(MobileViTConfig(num_labels=1000)).eval()
fast = torch.compile(model)
pixels = torch.randn(2, 3, 224, 224)
with torch.no_grad():
    for _ in range(2):
        logits = fast(pixel_values=pixels).logits
print("mvit", tuple(logits.shape))
