"""SGD with momentum built inside `fit`, gradients zeroed in place (`set_to_none=False`)."""
# expect: none

import torch


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    for _ in range(epochs):
        model.train()
        for x, y in train_loader:
            opt.zero_grad(set_to_none=False)
            out = model(x.to(device))
            loss_fn(out, y.to(device)).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            preds = torch.cat([model(x.to(device)).argmax(1) for x, _ in val_loader])
    return preds
