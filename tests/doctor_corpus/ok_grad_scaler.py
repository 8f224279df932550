"""AMP written for any device: float16 with a GradScaler on CUDA, bfloat16 without one elsewhere."""
# expect: none

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    device = torch.device(device)
    on_cuda = device.type == "cuda"
    dtype = torch.float16 if on_cuda else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=on_cuda)
    model.to(device)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=dtype):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        model.eval()
        with torch.inference_mode(), torch.autocast(device.type, dtype=dtype):
            for x, y in val_loader:
                model(x.to(device))
